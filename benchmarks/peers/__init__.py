"""The ``peers`` benchmark (``command``; the systems ``mounts``; ``operations``; the counting ``proxy``)."""
