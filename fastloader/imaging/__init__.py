"""Pixel code that both backends and the cache share: decoding, crop geometry, header screening."""
