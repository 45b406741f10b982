"""Process entry points: the command, the workers, the local cluster and the demo; what people see."""
