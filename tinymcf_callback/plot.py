"""``python -m tinymcf_callback.plot`` (the older form of ``tinymcf plot``), and the plotting functions' old path.

``from tinymcf_callback.plot import plot_histories`` keeps working: the functions live in
:mod:`tinymcf_callback.tools.plot` (drawing) and :mod:`tinymcf_callback.results.curves` (reading).
"""

import sys

from .cli.legacy import plot_main as main
from .errors import HistoryError, MissingExtraError
from .results.curves import History, Series, load_histories, load_history
from .tools.plot import draw, image_format, plot_histories, require_matplotlib, save_figure

MissingPlotExtraError = MissingExtraError
__all__ = ["History", "HistoryError", "MissingExtraError", "MissingPlotExtraError", "Series", "draw", "image_format",
           "load_histories", "load_history", "main", "plot_histories", "require_matplotlib", "save_figure"]

if __name__ == "__main__":
    sys.exit(main())
