"""The only code that touches torch.profiler, CUDA memory stats, clocks and the trainer."""
