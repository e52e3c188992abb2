from pathlib import Path

import pytest

from workbench.model.chain import Chain, Layer
from workbench.profiles import ProfileError, load_profile, read_profile, write_profile

HEADER = "name,forward_ms,backward_ms,weight_bytes,activation_bytes\n"


def write(tmp_path: Path, text: str, name="p.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_round_trip(tmp_path):
    c = Chain((Layer("a", 0.0015, 0.003, 100, 40, saved_bytes=12), Layer("b", 0.002, 0.004, 0, 8)),
              input_bytes=16, meta={"network": "toy", "batch_size": "4"})
    p = tmp_path / "toy.csv"
    write_profile(c, p)
    back = read_profile(p)
    assert back.meta["network"] == "toy" and back.meta["batch_size"] == "4"
    assert back.input_bytes == 16
    for x, y in zip(c.layers, back.layers):
        assert x.name == y.name
        assert x.forward == pytest.approx(y.forward) and x.backward == pytest.approx(y.backward)
        assert x.weight_bytes == y.weight_bytes and x.activation_bytes == y.activation_bytes
    assert back.saved(0) == 12 and back.saved(1) == 40


def test_metadata_and_optional_saved(tmp_path):
    p = write(tmp_path, "# network: n\n# input_bytes: 9\n" + HEADER + "x,1,2,3,4\n")
    c = read_profile(p)
    assert c.name == "n" and c.saved(0) == 9 and c.layers[0].forward == 0.001


@pytest.mark.parametrize("body,pattern", [
    ("name,forward_ms,weight_bytes,activation_bytes\nx,1,3,4\n", r"missing column.*backward_ms"),
    (HEADER + "x,1,abc,3,4\n", r"row 1 .*column 'backward_ms': not a number"),
    (HEADER + "x,1,2,3,4\ny,nan,2,3,4\n", r"row 2 .*column 'forward_ms': NaN"),
    (HEADER + "x,1,2,-3,4\n", r"row 1 .*column 'weight_bytes': negative"),
    (HEADER + "x,1,2,3,4\nx,1,2,3,4\n", r"row 2 .*duplicate layer name 'x'"),
    (HEADER, r"empty chain"),
    ("", r"empty profile"),
    ("# only: metadata\n", r"empty profile"),
    (HEADER + "x,1,2,3\n", r"row 1 .*4 fields, expected 5"),
    (HEADER + "x,1,2,3,\n", r"row 1 .*column 'activation_bytes': empty"),
    # values no measurement gives, and a header that says two things
    ("name,forward_ms,backward_ms,weight_bytes,activation_bytes,forward_ms\nx,1,2,3,4,5\n",
     r"line 1: column 'forward_ms' appears twice \(columns 2 and 6\)"),
    (HEADER + "x,1e300,2,3,4\ny,1,2,3,4\n", r"layer 1 \('x'\): forward_ms 1e\+300 is above 1e\+07 ms"),
    (HEADER + "x,1,2,3,4\ny,1,2e8,3,4\n", r"layer 2 \('y'\): backward_ms 2e\+08 is above"),
    (HEADER + "x,1,2,1e300,4\n", r"layer 1 \('x'\): weight_bytes 1e\+300 is above"),
    ("name,forward_ms,backward_ms,weight_bytes,activation_bytes,saved_bytes\nx,1,2,3,4,1e18\n",
     r"saved_bytes 1e\+18 is above"),
    (HEADER + "x,0,0,3,4\ny,0,0,3,4\n", r"every layer has zero forward and backward time"),
])
def test_bad_input_names_file_row_column(tmp_path, body, pattern):
    p = write(tmp_path, body, "bad.csv")
    with pytest.raises(ProfileError, match=pattern) as e:
        read_profile(p)
    assert "bad.csv" in str(e.value)


def test_unknown_profile_name():
    with pytest.raises(ProfileError, match="no such profile"):
        load_profile("definitely-not-a-profile")


def test_a_profile_with_no_memory_warns(tmp_path):
    from workbench.profiles import ProfileWarning

    with pytest.warns(ProfileWarning, match="every weight and activation size is 0"):
        read_profile(write(tmp_path, HEADER + "x,1,2,0,0\ny,1,2,0,0\n"))


def test_byte_order_mark_and_extra_numeric_columns_pass(tmp_path):
    p = tmp_path / "bom.csv"
    p.write_bytes(b"\xef\xbb\xbf" + (HEADER.strip() + ",grad_bytes\nx,1,2,3,4,7\n").encode())
    c = read_profile(p)
    assert c.layers[0].name == "x" and c.layers[0].forward == 0.001 and c.layers[0].weight_bytes == 3


def test_a_folder_is_not_a_profile(tmp_path):
    with pytest.raises(ProfileError, match="is a folder"):
        read_profile(tmp_path)
