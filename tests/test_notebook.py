"""open_notebook: a fresh database per notebook, dropped by the notebook's last cell (``await h.close()``)."""

from __future__ import annotations

from agentlab.runtime import db
from agentlab.runtime.notebook import open_notebook


async def test_the_last_cell_drops_the_notebooks_database(capsys):
    h = await open_notebook("zz")
    name = db.dbname_of(h.url)
    assert capsys.readouterr().out == "notebook zz: a fresh database is ready\n"
    assert name.startswith("agentlab_nbzz_") and name in db.list_databases()
    await h.close()
    assert name not in db.list_databases()  # a kernel killed after this cell leaves nothing behind


async def test_keep_leaves_the_database_for_inspection():
    h = await open_notebook("zz", keep=True)
    name = db.dbname_of(h.url)
    await h.close()
    try:
        assert name in db.list_databases()
    finally:
        db.drop_database(name)
