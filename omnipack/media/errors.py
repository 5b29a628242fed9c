from ..errors import SampleReject


class MediaError(SampleReject):
    """A media file cannot be read or used; the message is the reject reason."""
