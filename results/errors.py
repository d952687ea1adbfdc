"""The results package's one root exception."""


class ArtifactError(Exception):
    """An artifact that cannot be trusted or read: missing files, bad schema, hash mismatch."""


class InputMismatch(ArtifactError):
    """Arrays that do not fit the artifact's model inputs (count, shape or dtype); the caller's data, not the artifact, is wrong."""
