"""`pallasgen show`: how a kernel cuts its arrays into blocks, as text and SVG."""
