"""No password survives masking, whatever the URL holds."""

import pytest

from ddlsim.data.errors import InvalidModelSpecError
from ddlsim.data.models import check_model_spec
from ddlsim.data.specs.model import ModelSpec
from ddlsim.data.store import mask_url
from ddlsim.data.store.database import redact


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://u:s3cret@db/ddlsim", "postgresql://u:***@db/ddlsim"),
        # An unencoded '@', ':' or '/' in the password: the userinfo ends at the last '@'.
        ("postgresql://u:s3@cret@db/ddlsim", "postgresql://u:***@db/ddlsim"),
        ("postgresql+psycopg://u:s3:c/ret@db:5432/x", "postgresql+psycopg://u:***@db:5432/x"),
        (
            "postgresql://u:s3cret@db/x?password=s3cret&sslmode=require",
            "postgresql://u:***@db/x?password=***&sslmode=require",
        ),
        ("not a url://u:s3cret@", "not a url://u:***@"),
        ("postgresql://u@db/x", "postgresql://u@db/x"),
        ("sqlite:////tmp/store.db", "sqlite:////tmp/store.db"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked
    assert "s3" not in mask_url(url).replace("sqlite", "")


def test_redact_masks_a_repeated_url_and_its_password() -> None:
    url = "postgresql://u:s3@cret@db/x"
    text = f"could not open {url}: password 's3@cret' for user u rejected"
    assert "s3@cret" not in redact(text, url)
    assert "postgresql://u:***@db/x" in redact(text, url)


@pytest.mark.parametrize("attn", ["kernels-community/flash-attn3", "flash_attention_2"])
def test_attention_outside_torch_is_refused(attn: str) -> None:
    spec = ModelSpec.from_dict(
        {
            "source": "transformers",
            "class": "GPT2LMHeadModel",
            "config": {"n_layer": 1, "attn_implementation": attn},
            "inputs": {"batch_size": 1, "seq_len": 8},
        }
    )
    with pytest.raises(InvalidModelSpecError, match="allowed: eager, sdpa, flex_attention"):
        check_model_spec(spec)
