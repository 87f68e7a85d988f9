"""Drop-in modules for code written against the systems tfcoord replaces."""
