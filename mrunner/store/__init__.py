"""The model store: content-addressed blobs, manifests and tags under ``$MRUNNER_HOME/models``."""
