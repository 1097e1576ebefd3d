"""Cost reports: the terminal report (``terminal``) rendered from plan.json data."""
