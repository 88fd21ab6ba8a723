"""The parts of ``bench/gpu.py`` (the GPU check), a module each: the model and its loop
(``model``), CUPTI kernel sketches (``kernels``), CUDA-event phase times (``events``), NVML
(``nvml``), the always-on overhead (``overhead``) and the two-process straggler
(``straggler``). ``bench/gpu.py`` is the driver: it runs each part in a process of its own
and prints the figures; what each part measures is in its docstring."""
