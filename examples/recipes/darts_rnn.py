"""darts: a BlockRNNModel fit, measured by PerfCallback passed in `pl_trainer_kwargs`.

Run: python examples/recipes/darts_rnn.py [--root DIR]
"""

import argparse

import numpy as np
from darts import TimeSeries
from darts.models import BlockRNNModel

from lightning_perf import PerfCallback

parser = argparse.ArgumentParser()
parser.add_argument("--root", default=".")
root = parser.parse_args().root

series = TimeSeries.from_values(np.sin(np.arange(400) / 10).astype(np.float32))
train, val = series[:320], series[320:]

# --8<-- [start:recipe]
model = BlockRNNModel(
    input_chunk_length=24,
    output_chunk_length=6,
    model="LSTM",
    hidden_dim=16,
    n_epochs=2,
    batch_size=32,
    model_name="sine",
    work_dir=root,  # darts' default: ./darts_logs
    save_checkpoints=True,  # the report goes beside its checkpoints: <work_dir>/sine/perf
    pl_trainer_kwargs={"callbacks": [PerfCallback()], "enable_progress_bar": False},
)
model.fit(train, val_series=val)
# --8<-- [end:recipe]

# darts copies the callback into the Trainer it builds: the copy that measured the fit is there.
ran = next(c for c in model.trainer.callbacks if isinstance(c, PerfCallback))
print("report:", ran.report_path)
