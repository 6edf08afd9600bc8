"""Pixel arithmetic and format facts that need no file: crop geometry, the eval box, the JPEG marker
walk and any Pillow mode as RGB. A leaf: the decoders (fastloader.decoding), the draws and both
backends build on it."""
