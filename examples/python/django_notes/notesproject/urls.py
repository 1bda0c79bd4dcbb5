from django.urls import path

from notes import views

urlpatterns = [
    path("healthz", views.healthz),
    path("v1/users/<str:uid>/notes", views.notes),
]
