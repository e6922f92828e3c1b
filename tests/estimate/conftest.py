import pytest


@pytest.fixture(autouse=True, scope="session")
def _demo_built(demo_home):
    """The demo preset's model is a local folder: its estimate reads the built config.json."""
    return demo_home
