"""The admin's Models page: pull from a form (refusals as the form's errors), the list with
each model's figures and the store's disk, progress cells the page keeps current, deletion
refused while a deployment uses a model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from django.contrib.auth.models import User

from deployments.models import Deployment
from deployments.store.models import PullState, StoredModel
from tests.conftest import run_queue

if TYPE_CHECKING:
    from django.test import Client

    from tests.store_support import Store

PAGE = "/admin/deployments/storedmodel/"


@pytest.fixture
def admin_client_(client: Client, transactional_db: None) -> Client:
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw-123456"))
    return client


def test_it_pulls_from_the_form_and_lists_what_the_store_holds(
    store: Store, admin_client_: Client, tiny_gguf: bytes
) -> None:
    store.repo("acme/tiny-GGUF", {"tiny.gguf": tiny_gguf})
    form = admin_client_.post(PAGE + "add/", {"source": "hf:acme/tiny-GGUF", "name": "tiny"})
    assert form.status_code == 302, form.content.decode()[:2000]
    assert StoredModel.objects.get(name="tiny").state == PullState.QUEUED
    queued = admin_client_.get(PAGE).content.decode()
    assert 'data-state="queued"' in queued and "store_live.js" in queued
    run_queue()
    Deployment.objects.create(name="chat", loader="llama_server", model="store:tiny")
    page = admin_client_.get(PAGE).content.decode()
    assert 'data-state="ready"' in page
    for text in ("gguf", "467.0 KiB", "0.1 M", "F32", "32768", "llama_server", "chat"):
        assert text in page, text
    assert "in 1 model;" in page and "free of" in page  # the store's disk
    shown = admin_client_.get(PAGE + f"{StoredModel.objects.get(name='tiny').pk}/change/")
    assert shown.status_code == 200 and "architecture" in shown.content.decode()
    # The deployment form offers it in the model box, with the loader its format suggests.
    offered = admin_client_.get("/admin/deployments/deployment/add/").content.decode()
    assert 'list="ms-stored-models"' in offered
    option = '<option value="store:tiny" data-loader="llama_server" data-usecase="generate">'
    assert option in offered


def test_it_shows_a_refused_pull_as_the_forms_error(store: Store, admin_client_: Client) -> None:
    bad = admin_client_.post(PAGE + "add/", {"source": "--index-url=http://evil"})
    assert bad.status_code == 200
    assert "not a source" in bad.content.decode()
    named = admin_client_.post(PAGE + "add/", {"source": "hf:a/b", "name": "../up"})
    assert "Use letters, digits" in named.content.decode()
    assert not StoredModel.objects.exists()


def test_it_refuses_to_delete_a_model_a_deployment_uses(
    store: Store, admin_client_: Client, tiny_gguf: bytes
) -> None:
    store.repo("acme/used", {"tiny.gguf": tiny_gguf})
    admin_client_.post(PAGE + "add/", {"source": "hf:acme/used"})
    run_queue()
    model = StoredModel.objects.get(name="used")
    Deployment.objects.create(name="chat", loader="llama_server", model="store:used")
    answer = admin_client_.post(PAGE + f"{model.pk}/delete/", {"post": "yes"}, follow=True)
    assert "used by chat" in answer.content.decode()
    assert StoredModel.objects.filter(name="used").exists()
    assert (store.root / "used").exists()
