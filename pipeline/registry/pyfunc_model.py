"""The fraud model as an MLflow pyfunc, logged as "models from code".

MLflow copies this file into the model's artifacts and executes it at load time (it is never
imported as ``pipeline.registry.pyfunc_model``), so it may only import MLflow, numpy/pandas and
``models.fraud_mlp`` (shipped next to it through ``code_paths``). Nothing is pickled: the weights,
normalisation statistics and temperature are the ``model_dir`` artifact (safetensors + JSON) and
are read with :func:`models.fraud_mlp.load_model`, which never unpickles.

Contract: ``predict(DataFrame of raw feature rows)`` -> float64 array of calibrated fraud
probabilities, one per row. The logged signature names the required feature columns.
"""

import mlflow
import numpy as np
import pandas as pd

from models.fraud_mlp import frame_to_tensors, load_model

MODEL_DIR_ARTIFACT = "model_dir"


class FraudPyfuncModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        self.model = load_model(context.artifacts[MODEL_DIR_ARTIFACT])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> np.ndarray:
        numeric, categorical = frame_to_tensors(model_input, self.model.config)
        return self.model.predict_proba(numeric, categorical).numpy().astype(np.float64)


mlflow.models.set_model(FraudPyfuncModel())
