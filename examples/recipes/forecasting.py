"""pytorch-forecasting: a TemporalFusionTransformer fit and its forecasts, measured by PerfCallback.

Run: python examples/recipes/forecasting.py [--root DIR]
"""

import argparse
import os

import numpy as np
import pandas as pd
from lightning.pytorch import Trainer
from pytorch_forecasting import TemporalFusionTransformer, TimeSeriesDataSet

from lightning_perf import PerfCallback

parser = argparse.ArgumentParser()
parser.add_argument("--root", default="forecasting_logs")
root = parser.parse_args().root

# Four noisy sine series of 200 steps; the last 40 steps are for validation.
t = np.arange(200)
rng = np.random.default_rng(0)
frames = [
    pd.DataFrame({"time_idx": t, "series": str(s), "value": np.sin(t / (5 + s)) + 0.1 * rng.standard_normal(200)})
    for s in range(4)
]
df = pd.concat(frames, ignore_index=True)
df["series"] = df["series"].astype("category")
train = TimeSeriesDataSet(
    df[df.time_idx <= 160],
    time_idx="time_idx",
    target="value",
    group_ids=["series"],
    max_encoder_length=24,
    max_prediction_length=6,
    static_categoricals=["series"],
    time_varying_known_reals=["time_idx"],
    time_varying_unknown_reals=["value"],
)
val = TimeSeriesDataSet.from_dataset(train, df, min_prediction_idx=161, stop_randomization=True)
train_dl = train.to_dataloader(train=True, batch_size=32, num_workers=0)
val_dl = val.to_dataloader(train=False, batch_size=32, num_workers=0)
tft = TemporalFusionTransformer.from_dataset(train, hidden_size=8, attention_head_size=1, hidden_continuous_size=4)

# --8<-- [start:recipe]
# fit: your own Trainer, with the callback.
trainer = Trainer(max_epochs=2, gradient_clip_val=0.1, default_root_dir=root, callbacks=[PerfCallback()])
trainer.fit(tft, train_dataloaders=train_dl, val_dataloaders=val_dl)

# predict: the library builds a new Trainer for each call. Do not pass the callback in trainer_kwargs
# (pytorch-forecasting then drops its own prediction callback); Lightning adds configure_callbacks' to every call.
tft.configure_callbacks = lambda: [PerfCallback(dirpath=os.path.join(root, "predict_perf"))]
forecast = tft.predict(val_dl, trainer_kwargs={"logger": False, "enable_progress_bar": False})
# --8<-- [end:recipe]

print("report:", trainer.callbacks[0].report_path if isinstance(trainer.callbacks[0], PerfCallback) else None)
print("forecast:", tuple(forecast.shape))
