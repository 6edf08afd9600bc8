"""Reading images into pixels, which both backends, screening and the cache share: decoding as few
pixels as a crop needs, header screening, each image's stored size, and reads in worker processes.
They read bytes through fastloader.sources.reading; the arithmetic they use is fastloader.imaging's."""
