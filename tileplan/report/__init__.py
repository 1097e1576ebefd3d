"""Cost reports: the terminal report (``terminal``, rendered from plan.json data) and the
self-contained HTML report of a package (``html``, with matplotlib plots from ``plots``)."""
