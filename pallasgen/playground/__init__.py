"""`pallasgen playground`: a static site that runs the build path in the browser (Pyodide)."""
