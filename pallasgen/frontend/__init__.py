"""Front end: spec text to a Lark tree (`parser`, `grammar.lark`) to the typed IR with positions (`transform`, `ir`); `errors` prints diagnostics."""
