"""The DALI backend. Importing it binds the NVIDIA wheel's nvJPEG under its soname where nothing
has bound one yet (fastloader.cuda_libraries, also done at `import fastloader`), so that DALI's
decoders get the nvJPEG the decode plan is made for."""
from fastloader.cuda_libraries import bind_wheel_nvjpegs

bind_wheel_nvjpegs()
