class MediaError(ValueError):
    """A media file cannot be read or used; the message is the reject reason."""


class MediaRejected(ValueError):
    """The media item cannot be used with this profile; the message is the reject reason."""
