"""Run folders: publishing output folders atomically."""
