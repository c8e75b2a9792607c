"""The encoding families, one module each; every module here registers its families with
:func:`posstats.geometry.encodings.catalog.register` when imported (the package imports them all)."""
