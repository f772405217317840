"""`check_coco` and ``visionblocks check-coco``: the linter agrees with the dataset, reports
every problem, exits 0/1, and ``--fix`` writes a cleaned copy without touching the input."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

from tests.data.test_coco_field import EXPECTED, FIELD, IMAGES
from visionblocks.cli import main
from visionblocks.data import CocoInstances
from visionblocks.data.check import check_coco


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("masks", [False, True])
def test_the_linter_reports_what_the_dataset_drops(name, masks):
    report = check_coco(FIELD / name, masks=masks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = CocoInstances(IMAGES, FIELD / name, with_masks=masks)
    assert report.invalid == dataset.dropped
    assert report.ok == (not dataset.dropped) and not report.file_problems
    assert report.counts["annotations"] == len(
        json.loads((FIELD / name).read_text())["annotations"]
    )


def test_report_lists_reasons_counts_ids_examples_and_repairs():
    text = str(check_coco(FIELD / "coco_annotator.json"))
    assert "3 images, 5 annotations, 2 categories" in text
    assert "invalid annotations (3 of 5: the dataset drops them)" in text
    assert "nonfinite" in text and "ids 33, 35" in text
    assert "annotation 33: segmentation polygon 0 has NaN or inf" in text  # an example message
    assert "missing_iscrowd" in text and "ids 34" in text  # repaired on load, not a problem
    assert text.rstrip().endswith("3 problem(s): `--fix OUT.json` writes a cleaned copy")


@pytest.mark.slow
def test_images_are_checked_for_presence_readability_and_size(tmp_path):
    shutil.copytree(IMAGES, tmp_path / "images")
    (tmp_path / "images" / "rgb.jpg").write_bytes(b"not a jpeg")
    report = check_coco(FIELD / "resized.json", images=tmp_path / "images")
    assert report.image_problems == {"unreadable_file": [1], "size_mismatch": [2]}
    assert any("EXIF orientation 6" in m for m in report.examples["size_mismatch"])
    (tmp_path / "images" / "rgb.jpg").unlink()
    report = check_coco(FIELD / "resized.json", images=tmp_path / "images")
    assert report.image_problems["missing_file"] == [1]


def test_cli_exit_codes_and_fix(tmp_path, capsys):
    assert main(["check-coco", str(FIELD / "lvis.json"), "--images", str(IMAGES)]) == 0
    assert "ok: the dataset loads every annotation" in capsys.readouterr().out
    source = FIELD / "cvat.json"
    before = source.read_bytes()
    assert main(["check-coco", str(source)]) == 1
    out = tmp_path / "clean" / "cvat.json"
    assert main(["check-coco", str(source), "--images", str(IMAGES), "--fix", str(out)]) == 0
    assert "wrote a cleaned copy" in capsys.readouterr().out
    assert source.read_bytes() == before  # the input is never modified
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cleaned copy loads without a warning
        fixed = CocoInstances(IMAGES, out)
        assert main(["check-coco", str(out)]) == 0
        warnings.simplefilter("ignore")
        original = CocoInstances(IMAGES, source)
    assert fixed.ids == original.ids
    for index in range(len(fixed)):
        a, b = fixed[index][1], original[index][1]
        assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["labels"], b["labels"])
    data = json.loads(out.read_text())
    assert data["info"] == json.loads(before)["info"]  # unknown fields survive
    assert data["annotations"][2]["bbox"] == [50.0, 30.0, 14.0, 18.0]  # clipped to the image


def test_fix_keep_repairable_keeps_boxes_without_their_segmentation(tmp_path):
    out = tmp_path / "fixed.json"
    args = ["check-coco", str(FIELD / "resized.json"), "--keep-repairable", "--fix", str(out)]
    assert main(args) == 0
    kept = {a["id"]: a for a in json.loads(out.read_text())["annotations"]}
    assert sorted(kept) == [1, 2, 3, 4, 5] and "segmentation" not in kept[1]


def test_fix_drops_orphans_and_images_whose_file_is_missing(tmp_path):
    data = json.loads((FIELD / "roboflow.json").read_text())
    data["annotations"].append({"id": 9, "image_id": 77, "category_id": 1, "bbox": [1, 1, 4, 4]})
    data["images"].append({"id": 5, "file_name": "gone.jpg", "height": 48, "width": 64})
    data["annotations"].append({"id": 10, "image_id": 5, "category_id": 1, "bbox": [1, 1, 4, 4]})
    source = tmp_path / "ann.json"
    source.write_text(json.dumps(data))
    report = check_coco(source, images=IMAGES)
    assert len(report.file_problems) == 1 and "point at image ids 77" in report.file_problems[0]
    assert report.image_problems == {"missing_file": [5]} and report.fixable
    fixed = report.fixed()
    assert [i["id"] for i in fixed["images"]] == [0, 1]
    assert [a["id"] for a in fixed["annotations"]] == [0, 2, 3]


def test_unfixable_files_and_bad_arguments(tmp_path, capsys):
    data = json.loads((FIELD / "lvis.json").read_text())
    data["images"].append(dict(data["images"][0]))  # a duplicate image id
    source = tmp_path / "dup.json"
    source.write_text(json.dumps(data))
    out = tmp_path / "out.json"
    assert main(["check-coco", str(source), "--fix", str(out)]) == 1
    captured = capsys.readouterr()
    assert (
        "duplicate images ids 9" in captured.out and "cannot write a cleaned copy" in captured.err
    )
    assert not out.exists()
    broken = tmp_path / "broken.json"
    broken.write_text('{"images": [')
    assert main(["check-coco", str(broken)]) == 1
    assert "is not valid JSON" in capsys.readouterr().out
    assert main(["check-coco", str(tmp_path / "nope.json")]) == 1
    assert "annotation file not found" in capsys.readouterr().err
    clean = tmp_path / "lvis.json"
    shutil.copy(FIELD / "lvis.json", clean)
    with pytest.raises(ValueError, match="would overwrite the checked file"):
        check_coco(clean).write_fixed(clean)
    assert main(["check-coco", str(clean), "--fix", str(clean)]) == 1


def test_progress_bars_on_request(capsys):
    check_coco(FIELD / "cvat.json", images=IMAGES, progress=True)
    assert "checking annotations" in capsys.readouterr().err
