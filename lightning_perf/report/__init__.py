"""Writers for what a human reads: TensorBoard, files and the console. They format; they don't decide."""
