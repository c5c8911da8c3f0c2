"""Rendering: plans to Python source through Jinja2 templates, then black, in-process."""
