"""Everything that runs beside training and makes records: the rank agent's collectors
(stacks, PyTorch, CUPTI), the node agent (NVML), kernel sketches, the Kafka publisher with
its disk spool, the Kineto trace importer and the cluster simulator."""
