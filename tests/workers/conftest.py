from __future__ import annotations

import pytest

from tests.workers import tiny_models


@pytest.fixture(scope="session")
def ner_model_dir(tmp_path_factory):
    return str(tiny_models.make_ner_model(tmp_path_factory.mktemp("ner-model")))


@pytest.fixture(scope="session")
def nli_model_dir(tmp_path_factory):
    return str(tiny_models.make_nli_model(tmp_path_factory.mktemp("nli-model")))
