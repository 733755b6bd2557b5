"""The appliance's env file is read one way, as systemd reads it for the services, by the upgrader, the supervisor
and the smoke test (appliance/env_file.py)."""

from appliance import ai_factory, env_file


def test_the_env_file_is_read_as_systemd_reads_an_environment_file(tmp_path):
    path = tmp_path / "env"
    path.write_text("# written by install.sh\n; a comment systemd also skips\n\n"
                    "FACTORY_URL = \"http://127.0.0.1:8001\"\nGREETING='good morning'\nEMPTY=\n"
                    "HALF_QUOTED=\"x\nexport NOT_AN_ASSIGNMENT=1\nno equals sign\n")

    assert env_file.read(path) == {"FACTORY_URL": "http://127.0.0.1:8001", "GREETING": "good morning", "EMPTY": "",
                                   "HALF_QUOTED": '"x'}
    assert env_file.read(tmp_path / "missing", missing_ok=True) == {}


def test_the_upgrader_sees_the_values_the_services_see(tmp_path):
    (tmp_path / "env").write_text("FACTORY_URL='http://127.0.0.1:8001'\nexport DATABASE_URL=postgres://elsewhere\n")

    env = ai_factory.Appliance(tmp_path, "none").env()

    assert env["FACTORY_URL"] == "http://127.0.0.1:8001"
    assert env.get("DATABASE_URL") != "postgres://elsewhere"
    assert env["FACTORY_DATA_DIR"] == str(tmp_path / "data")
