"""The IPU side of Keras models: the extensions a model made in an
IPUStrategy scope gets (extension.py)."""
