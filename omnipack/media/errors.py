from ..errors import SampleReject


class MediaError(SampleReject):
    """A media file cannot be read or used; the message is the reject reason."""


class MediaRejected(SampleReject):
    """The media item cannot be used with this profile; the message is the reject reason."""
