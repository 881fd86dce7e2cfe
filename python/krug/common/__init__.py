"""Framework-independent parts of the krug Python package."""
