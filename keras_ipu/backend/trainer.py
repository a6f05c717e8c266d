from keras.src.trainers import trainer as base_trainer


class IPUTrainer(base_trainer.Trainer):
    pass
