"""Ray entrypoints. Each module parses arguments, fans out actors and calls posstats; the
mathematics lives in posstats. Ray is imported lazily, inside the functions that need it."""
