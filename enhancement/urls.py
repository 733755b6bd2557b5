from django.urls import path
from rest_framework.routers import SimpleRouter

from enhancement import api, views

router = SimpleRouter()
router.register("enhancement/datasets", api.DatasetViewSet, basename="enhancement-dataset")
router.register("enhancement/jobs", api.JobViewSet, basename="enhancement-job")
api_urlpatterns = [*router.urls, path("enhancement/plan/", api.PlanView.as_view(), name="enhancement-plan")]

urlpatterns = [
    path("enhancement/", views.home, name="enhancement"),
    path("enhancement/datasets/<int:dataset_id>/", views.dataset_page, name="enhancement-dataset"),
    path("enhancement/jobs/new/", views.new_job, name="enhancement-new-job"),
    path("enhancement/jobs/<int:job_id>/", views.job_page, name="enhancement-job"),
    path("enhancement/jobs/<int:job_id>/live/", views.job_live, name="enhancement-job-live"),
]
