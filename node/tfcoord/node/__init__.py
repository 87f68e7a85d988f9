"""What runs on each TensorFlow node: register, wait for the cluster, run, report."""
