class IPUExportArchive:
    pass
