"""The web console: static pages at /console that talk only to the public API."""
