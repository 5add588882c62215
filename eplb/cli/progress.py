"""Progress bars for long work: shown on a terminal, silent when piped, under --json or --quiet."""

import sys
from collections.abc import Callable

from tqdm import tqdm


class Progress:
    """A progress bar on stderr that draws only when stderr is a terminal and `enabled` is true."""

    def __init__(self, description: str, enabled: bool = True) -> None:
        self._enabled = enabled and sys.stderr.isatty()
        self._bar: tqdm | None = None
        self._description = description

    def callback(self) -> Callable[[int, int], None]:
        """A `(done, total)` callback that advances the bar."""

        def update(done: int, total: int) -> None:
            if not self._enabled:
                return
            if self._bar is None:
                self._bar = tqdm(total=total, desc=self._description, file=sys.stderr, leave=False)
            self._bar.n = done
            self._bar.refresh()

        return update

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
