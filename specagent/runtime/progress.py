"""Progress bars for the long loops (episodes, mining, offline acceptance).

On a terminal a bar redraws in place; written to a file or a pipe (a background job's log,
CI) every redraw would be a new line, so there it draws at most once every
``LOG_INTERVAL_S`` seconds."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

LOG_INTERVAL_S = 30.0


def progress(iterable: Any = None, **kwargs: Any) -> tqdm:
    """``tqdm(iterable, **kwargs)`` on stderr, sparse when stderr is not a terminal."""
    stream = kwargs.setdefault("file", sys.stderr)
    if not (hasattr(stream, "isatty") and stream.isatty()):
        kwargs.setdefault("mininterval", LOG_INTERVAL_S)
        kwargs.setdefault("maxinterval", LOG_INTERVAL_S * 4)
    return tqdm(iterable, **kwargs)
