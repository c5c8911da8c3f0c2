"""Jinja2 templates of generated modules; a package so that they ship inside the wheel."""
