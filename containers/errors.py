"""The containers package's one root exception, and the kinds callers tell apart."""


class ContainerError(Exception):
    """A serving failure the user should see as one clear line."""

    exit_code = 1


class BackendUnavailable(ContainerError):
    """The container engine (or the cgroup tree) cannot be reached or used."""


class UnknownContainer(ContainerError):
    """A container name the backend does not manage."""

    exit_code = 2


class ScenarioError(ContainerError):
    """A scenario, target or deployment request that cannot be used as given."""

    exit_code = 2


class BadPayload(ContainerError):
    """An HTTP body that is not a valid npy, npz or JSON payload of the model server's wire format."""


class InferenceRejected(ContainerError):
    """A request the model server refused; ``status`` is the HTTP status it answered with."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class PlanError(ContainerError):
    """A placement plan that cannot be made or used: an SLO no configuration meets, or a plan file that is not valid."""

    exit_code = 2
