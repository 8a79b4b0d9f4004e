"""Small utilities every side uses: the one atomic writer, sha256 digests, the canonical JSON
encodings, where the checkout is, and the errors the tools raise on purpose. Standard library only."""
