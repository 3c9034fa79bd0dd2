"""textkit: small, dependency-free helpers for everyday text.

Each helper lives in its own module:

- ``textkit.slug.slugify`` turns a title into a URL slug.
- ``textkit.words.word_count`` counts the words in a text.
- ``textkit.truncate.truncate`` shortens a text to a width, marking the cut.
"""

__version__ = "0.1.0"
