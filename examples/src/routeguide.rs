//! `routeguide.RouteGuide`, gRPC's streaming example: features on a grid of points.
//!
//! `ListFeatures` streams from a task through a small channel, so the service produces only
//! as fast as its client reads, and notices when the client goes away; it reports both
//! through the observer (the example server prints them, the tests read them).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::routeguide_pb::route_guide_server::RouteGuide;
use crate::routeguide_pb::{Feature, Point, Rectangle, RouteNote, RouteSummary};

/// Receives the service's notable events, one line each.
pub type Observer = Arc<dyn Fn(String) + Send + Sync>;

/// The notes left at each (latitude, longitude).
type Notes = HashMap<(i32, i32), Vec<RouteNote>>;

/// The RouteGuide service over a fixed set of features.
#[derive(Clone)]
pub struct RouteGuideService {
    features: Arc<Vec<Feature>>,
    notes: Arc<Mutex<Notes>>,
    observer: Observer,
}

impl std::fmt::Debug for RouteGuideService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteGuideService")
            .field("features", &self.features.len())
            .finish()
    }
}

/// The location of feature `i` of a grid: rows of 100 features, 1000 units apart.
pub fn grid_point(i: usize) -> Point {
    Point {
        latitude: 400_000_000 + (i / 100) as i32 * 1000,
        longitude: -740_000_000 + (i % 100) as i32 * 1000,
    }
}

impl RouteGuideService {
    /// `count` features named `feature <i>` at [`grid_point`]`(i)`; events go to `observer`.
    pub fn new(count: usize, observer: Observer) -> RouteGuideService {
        let features = (0..count)
            .map(|i| Feature {
                name: format!("feature {i}"),
                location: Some(grid_point(i)),
            })
            .collect();
        RouteGuideService {
            features: Arc::new(features),
            notes: Arc::default(),
            observer,
        }
    }

    fn feature_at(&self, point: &Point) -> Option<&Feature> {
        self.features
            .iter()
            .find(|f| f.location.as_ref() == Some(point))
    }
}

fn in_range(point: &Point, rect: &Rectangle) -> bool {
    let (lo, hi) = (rect.lo.unwrap_or_default(), rect.hi.unwrap_or_default());
    let (left, right) = (
        lo.longitude.min(hi.longitude),
        lo.longitude.max(hi.longitude),
    );
    let (bottom, top) = (lo.latitude.min(hi.latitude), lo.latitude.max(hi.latitude));
    (left..=right).contains(&point.longitude) && (bottom..=top).contains(&point.latitude)
}

/// Great-circle distance in metres between points in E7 degrees.
fn distance(a: &Point, b: &Point) -> i32 {
    const R: f64 = 6_371_000.0;
    let rad = |e7: i32| (e7 as f64 / 1e7).to_radians();
    let (lat1, lat2) = (rad(a.latitude), rad(b.latitude));
    let dlat = lat2 - lat1;
    let dlon = rad(b.longitude) - rad(a.longitude);
    let h = (dlat / 2.0).sin().powi(2) + lat1.cos() * lat2.cos() * (dlon / 2.0).sin().powi(2);
    (R * 2.0 * h.sqrt().atan2((1.0 - h).sqrt())) as i32
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl RouteGuide for RouteGuideService {
    async fn get_feature(&self, request: Request<Point>) -> Result<Response<Feature>, Status> {
        let point = request.into_inner();
        Ok(Response::new(self.feature_at(&point).cloned().unwrap_or(
            Feature {
                name: String::new(),
                location: Some(point),
            },
        )))
    }

    type ListFeaturesStream = BoxStream<Feature>;

    /// Streams the features in the rectangle. With request metadata `x-limit: N`, stops after
    /// N and ends with `RESOURCE_EXHAUSTED` (a status after messages, carried in trailers,
    /// with trailer metadata `x-sent`). Response metadata `x-request-id` echoes the request's.
    async fn list_features(
        &self,
        request: Request<Rectangle>,
    ) -> Result<Response<Self::ListFeaturesStream>, Status> {
        let request_id = request.metadata().get("x-request-id").cloned();
        let limit = match request.metadata().get("x-limit") {
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|s| s.parse::<usize>().ok())
                    .ok_or_else(|| Status::invalid_argument("x-limit must be a number"))?,
            ),
            None => None,
        };
        let rect = request.into_inner();
        if rect.lo.is_none() || rect.hi.is_none() {
            return Err(Status::invalid_argument("a rectangle needs lo and hi"));
        }
        let (tx, rx) = mpsc::channel(4);
        let features = self.features.clone();
        let observer = self.observer.clone();
        tokio::spawn(async move {
            let mut sent = 0usize;
            for feature in features.iter() {
                if !in_range(&feature.location.unwrap_or_default(), &rect) {
                    continue;
                }
                if limit == Some(sent) {
                    let mut status = Status::resource_exhausted(format!("limit of {sent} reached"));
                    status
                        .metadata_mut()
                        .insert("x-sent", sent.to_string().parse().expect("digits"));
                    let _ = tx.send(Err(status)).await;
                    return;
                }
                if tx.send(Ok(feature.clone())).await.is_err() {
                    observer(format!("list_features: client went away after {sent}"));
                    return;
                }
                sent += 1;
            }
            observer(format!("list_features: sent all {sent}"));
        });
        let mut response = Response::new(Box::pin(ReceiverStream::new(rx)) as BoxStream<Feature>);
        if let Some(id) = request_id {
            response.metadata_mut().insert("x-request-id", id);
        }
        Ok(response)
    }

    async fn record_route(
        &self,
        request: Request<Streaming<Point>>,
    ) -> Result<Response<RouteSummary>, Status> {
        let mut stream = request.into_inner();
        let started = Instant::now();
        let mut summary = RouteSummary::default();
        let mut last: Option<Point> = None;
        while let Some(point) = stream.next().await {
            let point = point?;
            summary.point_count += 1;
            if self.feature_at(&point).is_some() {
                summary.feature_count += 1;
            }
            if let Some(last) = last {
                summary.distance += distance(&last, &point);
            }
            last = Some(point);
        }
        summary.elapsed_time = started.elapsed().as_secs() as i32;
        Ok(Response::new(summary))
    }

    type RouteChatStream = BoxStream<RouteNote>;

    /// For each note received, sends back every earlier note at the same location, then
    /// remembers it.
    async fn route_chat(
        &self,
        request: Request<Streaming<RouteNote>>,
    ) -> Result<Response<Self::RouteChatStream>, Status> {
        let mut inbound = request.into_inner();
        let notes = self.notes.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Some(note) = inbound.next().await {
                let note = match note {
                    Ok(note) => note,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                let location = note.location.unwrap_or_default();
                let key = (location.latitude, location.longitude);
                let earlier = {
                    let mut notes = notes.lock().unwrap_or_else(|e| e.into_inner());
                    let at = notes.entry(key).or_default();
                    let earlier = at.clone();
                    at.push(note);
                    earlier
                };
                for note in earlier {
                    if tx.send(Ok(note)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
