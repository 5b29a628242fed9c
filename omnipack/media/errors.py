class MediaError(ValueError):
    """A media file cannot be read or used; the message is the reject reason."""
