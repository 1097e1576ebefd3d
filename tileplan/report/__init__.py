"""Cost reports: the terminal report (``terminal``, rendered from plan.json data) and the
self-contained HTML report of a package (``html``, with matplotlib plots from ``plots``).

Importing this package makes Python set ``tileplan.report`` to it, over the API function
``tileplan.report(package, html=None, compare=())``; so the package is callable, and a call
is ``render``, which that function calls too."""

import sys as _sys
import types as _types


def render(package, html=None, *, compare=()):
    """Write the HTML report of a package (default ``package/report.html``); returns its path
    (``compare``: other packages to show beside it)."""
    from pathlib import Path
    from .html import load_report_data, write_html
    data = load_report_data(package)
    others = [load_report_data(c) for c in ([compare] if isinstance(compare, (str, Path)) else compare)]
    return write_html(data, Path(html) if html is not None else Path(package) / "report.html", compare=others)


class _CallableModule(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        return render(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
