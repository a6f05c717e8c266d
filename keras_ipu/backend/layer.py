class IPULayer:
    pass
