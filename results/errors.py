"""The results package's one root exception."""


class ArtifactError(Exception):
    """An artifact that cannot be trusted or read: missing files, bad schema, hash mismatch."""
