"""The browser tool against a real headless Chromium, started by the program itself (see conftest.py)."""
