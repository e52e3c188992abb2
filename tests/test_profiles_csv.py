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
    # every column and every header value the workbench computes with is bounded (issue 23)
    (HEADER + "x,1e-300,1e-300,3,4\ny,1,2,3,4\n", r"layer 1 \('x'\): forward_ms 1e-300 is below 1e-06 ms"),
    (HEADER + "x,1,2,3,4\ny,1,1e-9,3,4\n", r"layer 2 \('y'\): backward_ms 1e-09 is below"),
    *[(f"name,forward_ms,backward_ms,weight_bytes,activation_bytes,{c}\nx,1,2,3,4,1e300\ny,1,2,3,4,1\n",
       rf"layer 1 \('x'\): {c} 1e\+300 is above 1.1259e\+15 bytes")
      for c in ("grad_bytes", "max_param_bytes", "saved_input_bytes", "saved_output_bytes", "forward_peak_bytes",
                "backward_peak_bytes", "cut_bytes")],
    # the backward split's pending bytes too (main printed them as a 306-digit memory)
    *[(f"name,forward_ms,backward_ms,weight_bytes,activation_bytes,weight_pending_bytes\nx,1,2,3,4,{v}\ny,1,2,3,4,1\n",
       rf"layer 1 \('x'\): weight_pending_bytes {shown} is above 1.1259e\+15 bytes")
      for v, shown in (("1e300", r"1e\+300"), (str(2 * 2**50), r"2.2518e\+15"))],
    ("# runtime_bytes: -5000000000\n" + HEADER + "x,1,2,3,4\n",
     r"metadata: runtime_bytes -5000000000: must be a number of bytes from 0 to 1 PiB"),
    ("# runtime_bytes: 1e300\n" + HEADER + "x,1,2,3,4\n", r"metadata: runtime_bytes 1e300"),
    ("# runtime_bytes: lots\n" + HEADER + "x,1,2,3,4\n", r"metadata: runtime_bytes lots"),
    ("# input_bytes: 1e300\n" + HEADER + "x,1,2,3,4\n", r"metadata: input_bytes 1e300"),
    ("# batch_size: 0\n" + HEADER + "x,1,2,3,4\n", r"metadata: batch_size 0: must be a whole number from 1"),
    ("# batch_size: 2.5\n" + HEADER + "x,1,2,3,4\n", r"metadata: batch_size 2.5"),
    ("# batch_size: unknowable\n" + HEADER + "x,1,2,3,4\n", r"metadata, column 'batch_size': not a number"),
    ("# dtype: float31\n" + HEADER + "x,1,2,3,4\n", r"metadata: dtype 'float31': must be one of float32"),
    ("# model_config: [1, 2]\n" + HEADER + "x,1,2,3,4\n", r"metadata: model_config: must be a JSON object"),
    ("# tied: [{\"owner\"\n" + HEADER + "x,1,2,3,4\n", r"metadata: tied: not JSON"),
    ('# tied: [{"owner": "x", "layers": ["x", "z"], "bytes": 8}]\n' + HEADER + "x,1,2,3,4\ny,1,2,3,4\n",
     r"tied, entry 1: \['z'\] are not layers of the profile"),
    ('# tied: [{"owner": "x", "layers": ["x", "y"], "bytes": -8}]\n' + HEADER + "x,1,2,3,4\ny,1,2,3,4\n",
     r"tied, entry 1: bytes -8: must be a number of bytes"),
    ('# tied: [{"owner": "y", "layers": ["x", "y"], "bytes": 8}]\n' + HEADER + "x,1,2,3,4\ny,1,2,3,4\n",
     r"tied, entry 1: layers must list the owner first"),
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


def test_a_negative_runtime_constant_cannot_make_a_plan_valid(tmp_path, capsys):
    """The issue's case: runtime_bytes -5e9 made every device's memory negative and `check --memory 1` said
    valid. The loader refuses the profile, and a chain built in code refuses the value too."""
    from workbench.front.cli import main

    good = write(tmp_path, HEADER + "x,1,2,1000,100\ny,1,2,1000,100\n", "good.csv")
    assert main(["plan", "--profile", str(good), "--devices", "2", "--json", str(tmp_path / "plan.json")]) == 0
    bad = write(tmp_path, "# runtime_bytes: -5000000000\n" + good.read_text(), "bad.csv")
    capsys.readouterr()
    assert main(["check", str(tmp_path / "plan.json"), "--profile", str(bad), "--memory", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "runtime_bytes -5000000000" in err and err.count("\n") == 1
    with pytest.raises(ValueError, match="runtime_bytes -5e9"):
        Chain((Layer("a", 1, 1, 10, 4),), meta={"runtime_bytes": "-5e9"})
    assert main(["check", str(tmp_path / "plan.json"), "--profile", str(good), "--memory", "1"]) == 1   # 2 KB > 1 B


def test_the_overlap_columns_round_trip_in_milliseconds(tmp_path):
    layer = Layer("a", 0.010, 0.020, 100, 10, comm_forward=0.002, comm_backward=0.003, exposed_forward=0.0005,
                  exposed_backward=0.001)
    path = tmp_path / "p.csv"
    write_profile(Chain((layer, Layer("b", 0.001, 0.002, 50, 20))), path)
    header = path.read_text().splitlines()
    assert any("comm_forward_ms" in line and "exposed_backward_ms" in line for line in header)
    back = load_profile(path)
    assert back.layers[0].comm_backward == pytest.approx(0.003) and back.layers[0].exposed_forward == pytest.approx(
        0.0005)
    assert back.layers[1].comm_forward is None
