"""The ``fsspec`` benchmark (``command``; the reading process ``child``)."""
