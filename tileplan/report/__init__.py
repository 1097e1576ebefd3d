"""Cost reports: the terminal report (``terminal``, rendered from plan.json data) and the
self-contained HTML report of a package (``html``, with matplotlib plots from ``plots``).

Importing this package makes Python set ``tileplan.report`` to it, over the API function
``tileplan.report(package, html=None, compare=())``; so the package is callable and a call
is that function's (``tileplan._report``)."""

import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        from .. import _report
        return _report(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
