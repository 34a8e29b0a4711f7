"""Files written whole: what :func:`~mmdropit.common.files.atomic_write` leaves."""
import os
import stat

import pytest

from mmdropit.common.files import atomic_write


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_new_file_gets_the_mode_open_would_give_it(tmp_path, umask_022):
    with atomic_write(tmp_path / 'epoch_1.pth') as stream:
        stream.write(b'weights')
    with open(tmp_path / 'plain', 'wb') as stream:
        stream.write(b'weights')
    assert _mode(tmp_path / 'epoch_1.pth') == _mode(tmp_path / 'plain') == 0o644


def test_a_replaced_file_keeps_its_mode(tmp_path, umask_022):
    target = tmp_path / 'last_checkpoint'
    target.write_text('epoch_1.pth')
    os.chmod(target, 0o640)
    with atomic_write(target, 'w') as stream:
        stream.write('epoch_2.pth')
    assert target.read_text() == 'epoch_2.pth'
    assert _mode(target) == 0o640


def test_a_failed_write_leaves_the_old_file_and_no_partial(tmp_path):
    target = tmp_path / 'memory_plan.json'
    target.write_text('{}')
    with pytest.raises(RuntimeError), atomic_write(target, 'w') as stream:
        stream.write('{"half":')
        raise RuntimeError('killed')
    assert target.read_text() == '{}'
    assert os.listdir(tmp_path) == ['memory_plan.json']


def test_a_file_system_without_modes_still_gets_the_file(tmp_path, monkeypatch):
    """vfat and some FUSE mounts refuse chmod: the write goes through, with the mode it got."""
    target = tmp_path / 'last_checkpoint'
    target.write_text('epoch_1.pth')

    def refused(*args, **kwargs):
        raise PermissionError('Operation not permitted')

    monkeypatch.setattr(os, 'chmod', refused)
    with atomic_write(target, 'w') as stream:
        stream.write('epoch_2.pth')
    assert target.read_text() == 'epoch_2.pth'
    assert os.listdir(tmp_path) == ['last_checkpoint']
